"""The runtime behind every collective call (private: its names may change).

* ``call``     -- one call's reliability options: timeout, on_timeout, validate;
* ``watch``    -- waiting under a deadline, and the roll call that names missing ranks;
* ``validate`` -- the agreement step of ``validate=True``;
* ``context``  -- per-communicator state: mpicoll's duplicate, tags, scratch, node layout,
  byte counters.
"""
