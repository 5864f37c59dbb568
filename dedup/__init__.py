"""Low side: deduplicate the raw topic into clean topic(s) and report gaps.

Module map (docs/dedup-internals.md "How it works" tells the story; each module's docstring
its part)::

    the gap detector (pure, no Spark)
      detector.py          one source partition's detector: windows, gaps, scans (docs/gaps.md)
      detector_set.py      many detectors in one value: a bucket's state, a direct state record
    rows and their classification
      rows.py              the row kinds: the detector's input rows, the rows the write tasks take
      classify_sql.py      raw records -> input rows in Spark SQL (the buckets layout)
      classify_python.py   raw records -> input rows in Python (the direct layout's tasks)
      detect.py            the stateful step: detectors over a group's input rows -> output rows
    the state layouts (the seam: nothing else branches on a layout)
      layouts/__init__.py  the layout file (its one reader), decide(), the auto rule, the interface
      layouts/buckets.py   Spark's stateful operator; ticks and resets into the control topic
      layouts/direct.py    a transaction per raw partition; ticks and resets into the raw partitions
    the query and its batches (driver)
      job.py               the Spark session and query: source, the layout's plan, write task
      batch_driver.py      the write task (write_task) and foreachBatch: runs a batch, folds results
      idle_tick.py         ticks: a batch at least once per gap-scan interval
      runner.py            runs the query until it stops
    the write tasks (executors) and their transactions
      commit.py            the one commit path of every layout (the effectively-once argument)
      transaction.py       a state partition's transaction: clean records, gaps, marker (buckets)
      direct_task.py       the direct layout's task: detect, write and keep state in one transaction
      direct_state.py      the direct layout's state record;  state_reader.py  reading it back
      fence.py             producers that fence their elders, and the markers
      task_result.py       what a task hands back to the driver
      clean_topics.py      the dedup's topics created and clean topics checked
      writer_settings.py   what the write side needs;  faults.py  crash-test fault points
    operators and processes
      cli.py               ``kafka-diode dedup`` (arguments, exit codes, reset)
      config.py            the settings (env names operators know)
      metrics.py           Prometheus series
      raw_position.py      how far behind each raw partition is
      gaps_cli.py  bundle_cli.py  bundle_create.py  raw_cli.py   the operators' tools
      spark_main.py  spark_compat.py  worker_daemon.py  worker_heap.py   Spark's processes
"""
