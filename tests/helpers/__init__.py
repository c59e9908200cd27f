"""What the tests share: starting servers, asking them, reading their streams and errors.
Test modules import from here, never from each other."""
