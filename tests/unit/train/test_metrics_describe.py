"""What ``eagle3 train``'s bar shows beside steps and ETA: the last record's loss, accuracies and
accept estimate."""

from __future__ import annotations

from eagle3.train.metrics import describe_record, plot_metrics


def test_the_bar_text_names_loss_accuracy_per_ttt_step_and_the_accept_estimate():
    record = {"step": 20, "loss": 2.3456, "acc": [0.412, 0.281], "accept_length_sim": 1.823}
    assert describe_record(record) == "loss 2.346 - acc [0.41, 0.28] - accept~1.82"
    assert describe_record({"step": 1}) == ""


def test_the_training_plot_draws_the_loss_of_each_ttt_step(tmp_path):
    records = [
        {"step": s, "loss": 3.0 / s, "loss_k": [2.0 / s, 4.0 / s], "acc": [0.1 * s, 0.05 * s]}
        for s in (1, 2)
    ]
    png = plot_metrics(records, tmp_path / "training.png")
    assert png is not None and png.read_bytes().startswith(b"\x89PNG")
