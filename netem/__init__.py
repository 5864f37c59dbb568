"""Network impairment: loss, duplication, reordering, delay, corruption."""
