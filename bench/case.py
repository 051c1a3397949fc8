"""The plugin API's stable import path for cases (``bench.model.case`` holds them): a Case is
one sweep point, frozen and validated; these are the names a variant file uses."""

from bench.model.case import CASE_DTYPES, DEVICES, DIRECTIONS, DTYPES, FP8, MASKS, Case, CaseError

__all__ = ["CASE_DTYPES", "DEVICES", "DIRECTIONS", "DTYPES", "FP8", "MASKS", "Case", "CaseError"]
