"""Fine-tuning: task data readers, heads wiring, predict, and the task metrics."""
