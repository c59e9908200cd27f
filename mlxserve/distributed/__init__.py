"""One model across several machines: mlx.launch starts mlxserve on every rank; rank 0
serves HTTP and runs the generation loop, the other ranks replay its steps in lockstep.

- world: the group of ranks, values shared at start, how the model is split.
- control: rank 0's TCP line to the other ranks (steps out, heartbeats back).
- lockstep: the engine's Lockstep for rank 0 (Leader) and the others (Follower).
- cluster: start-up of a rank, what stays single-machine, and what a fault does.
"""
