"""One trial, as a Ray worker runs it: with the models and the prepared data, the code a trial's identity hashes.

- ``loop``          ``run_trial``: train on prepared data, report metrics and a checkpoint every epoch; it knows
                    nothing of Ray or MLflow
- ``augment``       random crops and flips: drawn per epoch on the CPU, applied on the device (loop and whole step)
- ``device_data`` the prepared dataset moved once to the trial's device (uint8 images until a batch is drawn)
- ``checkpoint``    the checkpoint's format, writing and loading, and the RNG state it carries
- ``locality``      where each head looks, measured every epoch from each layer's own input
- ``whole_step``    ``train.compile: whole-step``: forward, backward and SGD captured as one CUDA graph
- ``device``        where a trial runs and in which precision, decided once and recorded
- ``report``        the contract with the driver: the per-epoch report's keys and the checkpoint's files
- ``code_version``  a trial's code identity (the normalised source of what it runs), and its check that it runs the
                    driver's code
- ``preemption``    a drain notice seen between batches: a mid-epoch checkpoint, the trial continues elsewhere
- ``node_check``    the cluster preflight made again on a trial's node (nodes that joined after the sweep began)
- ``trainable``     the Ray Tune adapter around ``run_trial``
"""
