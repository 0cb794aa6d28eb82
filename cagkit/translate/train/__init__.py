"""Training translators: paired prefill data, the losses, the loop and the held-out scoring."""
