"""What NCCL and nccl-tests print, read as text: the transport NCCL chose (``debug``), a benchmark's table (``perf``),
NCCL Inspector's JSON lines and Prometheus textfile (``inspector``).

Pure: no files, no threads, no Prometheus. The ``nccl`` command and the sources read the files and hand the lines
here.
"""

from mfu_exporter.nccl.debug import TransportFinding, TransportScanner, scan_transport

__all__ = ["TransportFinding", "TransportScanner", "scan_transport"]
