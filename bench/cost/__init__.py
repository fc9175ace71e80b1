"""What a deployment costs: billed seconds from measured timers, the autoscaler, fan-out."""
