"""What is stored: the task rows, the run history, the instances' heartbeats, and the pieces
the hand-written statements share (values, kept connections, what the database's errors say).
"""
