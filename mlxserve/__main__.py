from mlxserve.cli import main

main()
