"""Piecewise compilation: split a Dynamo graph at its splitting ops, plan the pieces, compile each one with Inductor
(once per distinct piece and size) and run the compiled pieces."""
