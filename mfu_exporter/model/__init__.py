"""The pure domain: FLOPs and MFU, jobs, checkpoints, attribution, history. No I/O, no hardware, no HTTP."""
