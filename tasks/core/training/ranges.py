"""The names of the torch loop's own parts on a profiler's timeline (`torch.profiler.record_function`):
a profile of a run says how long each took, which the GPU check's profile reports (benchmarks/gpu_profile.py).
Outside a profile a range costs a microsecond or two, and each is entered once an epoch."""

PREFIX = "mixedml: "
TRAIN_EPOCH = PREFIX + "train epoch"  # the timed part of an epoch: the samples/s figure's denominator
EPOCH_ORDER = PREFIX + "epoch order"  # the epoch's rows in training order, on the device
EPOCH_END = PREFIX + "epoch end"  # the last step's flags read, the epoch's sums all-reduced
