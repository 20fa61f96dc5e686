"""dapo: RL post-training of LLMs on verifiable rewards (DAPO with dynamic batch generation)."""

__version__ = "0.1.0"
