"""The run over time: phases, capacity steps and the knee, rollout steps."""
