import sys

from omni_ray.cli import main

if __name__ == "__main__":
    sys.exit(main())
