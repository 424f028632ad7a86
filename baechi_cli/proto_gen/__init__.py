"""Generated protobuf modules: do not edit; regenerate with ``python proto/build.py``."""
