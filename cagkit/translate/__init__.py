"""Translating KV between models: token alignment (`alignment`), the translators (`translator`), their cards
(`cards`) and their training (`train`)."""
