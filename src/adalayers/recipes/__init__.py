"""Recipes over the engine: training and scoring a side task on a task's data, and the checks after training.

    service.py   the application service: prepare(cfg), train(cfg, out), evaluate(run), predict(run, texts);
                 what the CLI's train, evaluate and predict commands call, and the one to use from Python
    train.py     fit(task, source, data, encoded, cfg, run_dir, ...): the AdaLayers recipe, run by
                 adalayers.engine.fit (its settings and the resume check built from the run config)
    evaluate.py  a side task over a split: outputs per row -> predictions per example -> metrics
    health.py    one-line warnings about a head whose numbers cannot be trusted
"""
