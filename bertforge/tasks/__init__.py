"""Fine-tuning and feature extraction, one module per task family."""
