"""Capture: what a traced call looked like and what every later call must satisfy (argument paths, specs, size
guards, the model's state, the input contract, request checks, compile ranges)."""
