"""The cost model: a step's price from the device (hardware.py), the model's shape (modelspec.py),
the roofline (model.py) and tensor parallelism (parallel.py); no torch. See docs/cost_model.md."""
