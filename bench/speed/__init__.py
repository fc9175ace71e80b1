"""Speed: start-up, per-job overhead, throughput, memory, threads, live latency, the GPU check."""
