"""The driver: what runs outside the Ray workers to plan, run, track and record a sweep (and, through
``tracked``, the fine-tune stages of ``pipeline.finetune``). Editing it never changes a trial's identity
(``pipeline.trial.code_version``: a trial's identity hashes the code it runs, none of this package).

The tune stage (``stages.tune``) reads it top-down:
- ``run``        the sweep: ``run_sweep``, its grid and reuse, what it publishes, its manifest
- ``tracked``    the tracked-run sequence the tune, prune and transform stages share (``run_tracked``): parent run,
                 decisions, Tuner, records, closing, the outage buffer flushed and parked
- ``tuner``      the Ray Tune side: the Tuner of the trials that train, a trial's config, whether a run restores
- ``grid``       variants x seeds, and what to do with each trial
- ``reuse``      the rule: reuse a finished run, resume an unfinished one from its checkpoint, or train
- ``checkpoints`` a trial folder's newest checkpoint that loads (resume, a replayed upload)
- ``identity``   what names a trial and a sweep (``trial_key``, ``tune-<hash>``), and the trial code
- ``preflight``  what is checked before Ray starts; ``dry_run``: what ``--dry-run`` prints
- ``tracking/``  MLflow behind one seam (its store interface: ``Store``): store and client, tags, parent run,
                 callback, outage buffer, models, registry
- ``manifest``   the tune manifest other stages read (no Ray, no MLflow)
- ``session``    attaching to Ray or starting a local one on 127.0.0.1; ``cluster``: checks on a multi-node cluster
- ``submit``     the stage as a Ray job from a workstation, its outputs brought back
- ``storage``    ``sweep.storage_path`` as a folder or a bucket; ``location``: where the stores live
- ``lock``       one tune (or prune) stage per project at a time; ``progress``: the console's trial table
- ``estimate``   what one trial of each variant needs (parameters, memory), before anything starts
- ``orphans``    the processes of a local Ray whose driver died, ended by the next run
- ``worker_deaths`` a worker Ray kills at any moment costs its trial one attempt, never the sweep
"""
