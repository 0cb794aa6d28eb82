"""cagkit inside other frameworks."""
