"""Thin framework callbacks over :class:`dk.pol.Recorder` (issue 12).

- :mod:`dk.integrations.lightning`: ``DkCallback``, a Lightning ``Callback``
  (``pip install 'dk-pol[lightning]'``).
- :mod:`dk.integrations.hf`: ``DkTrainerCallback``, a Hugging Face ``TrainerCallback``
  (``pip install 'dk-pol[hf]'``).

Each only wires the framework's model, optimizer, scheduler and data path to the Recorder;
every check and every recorded byte is the Recorder's (SPEC §11, §12.4). Nothing here is
imported by ``dk`` itself: import the sub-module you need.
"""
