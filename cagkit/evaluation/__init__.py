"""Evaluation data, answer metrics and benchmark reports for `cagkit eval`.

datasets: read question-answering files into `Example`s.
metrics:  SQuAD-style exact match and token F1, closed-set answer parsing.
report:   turn results JSON files into markdown tables and PNG charts.
"""
