"""What survives: many jobs or requests with every bad input and injected faults."""
