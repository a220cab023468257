"""Parameter updates: the updater (``updater.py``) with its optimizer (``optimizers.py``, chosen by
``optimizer_config.py``), the gradients' post-processing (``gradients.py``), float16's loss scale
(``loss_scale.py``, ``tf_amp``), and the learning rate
over epochs (``lr_control.py``, its file in ``lr_history.py``).

Stage 6 (training): may import runtime, config, report, datasets, model and distributed; imported by the
rest of ``engine.training``, tasks, tools and main.
"""
