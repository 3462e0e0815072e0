"""Experiments: decision records. Each answered a question the project had to decide (which
variant, how many fine-tuning steps, one sigma scale or not) and wrote its table; they are kept,
frozen, so a decision can be traced to what was measured."""
