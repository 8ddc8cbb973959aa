"""Top-1 accuracy as an `evaluate` metric shipped with hubvit, because `evaluate.load("accuracy")` needs the Hub.

Load it by path: `evaluate.load(path_to_this_file)`.
"""

import datasets
import evaluate


class Accuracy(evaluate.Metric):
    """Fraction of predictions equal to their reference label."""

    def _info(self):
        return evaluate.MetricInfo(
            description="Fraction of predicted class ids equal to the reference class ids.",
            citation="",
            inputs_description="predictions: predicted class ids (int); references: true class ids (int).",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        if not references:
            raise ValueError("accuracy of an empty evaluation set is undefined")
        correct = sum(int(p == r) for p, r in zip(predictions, references))
        return {"accuracy": correct / len(references)}
