"""The part of the project a user reuses without Flyte, in layers by pipeline stage: accelerators, data,
models, planning, training, bundle, evaluation, publish, scoring."""

import os

# TensorFlow's C++ INFO lines (the CPU instructions it was built without, and the like) ask nothing of
# a user; warnings and errors still show. Set before anything here imports TensorFlow, which reads it
# once; a value the user set is kept.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
