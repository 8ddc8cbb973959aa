"""Top-k accuracy (k = 5 by default) as an `evaluate` metric shipped with hubvit; loaded by path, offline.

Each prediction is the list of the model's k best class ids, best first; with fewer than k classes every class is
in the list and the accuracy is 1.
"""

import datasets
import evaluate


class Top5Accuracy(evaluate.Metric):
    """Fraction of references found among the first k predicted class ids."""

    def _info(self):
        return evaluate.MetricInfo(
            description="Fraction of reference class ids found among the k highest-scoring predicted class ids.",
            citation="",
            inputs_description="predictions: lists of class ids, best first (int); references: true class ids (int).",
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("int64")), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, k=5):
        if not references:
            raise ValueError("top-k accuracy of an empty evaluation set is undefined")
        hits = sum(int(r in list(p)[:k]) for p, r in zip(predictions, references))
        return {"top5_accuracy": hits / len(references)}
