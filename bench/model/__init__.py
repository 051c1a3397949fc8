"""The model: what a case, a mask, a variant and a sweep are."""
