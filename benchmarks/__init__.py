"""Speed, memory and overhead benchmarks (see benchmarks/README.md). Targets live here, never in timed tests."""
