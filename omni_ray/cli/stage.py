"""omni-ray stage (not built yet)."""


def add_arguments(p):
    pass


def run(args):
    from omni_ray.errors import UserError

    raise UserError("stage: not built yet")
