"""What NCCL and its tools print, parsed: pure text in, dataclasses out (no files, no threads, no Prometheus).

``inspector``: NCCL Inspector's JSON lines and Prometheus textfile (the nccl source tails them).
"""
