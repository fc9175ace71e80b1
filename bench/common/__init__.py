"""Shared by the benches: the machine, the corpus, schedules, the harness, reports and plots."""
