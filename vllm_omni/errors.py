"""Errors that mean "the input is wrong" (a checkpoint, a model directory), not "the code is"."""


class OmniInputError(ValueError):
    """One line naming what is wrong and where; the omni-ray CLI prints it and exits 2."""
