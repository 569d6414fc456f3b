"""In-repo fakes of hardware libraries, shared by the tests, the demo and the benchmarks."""
