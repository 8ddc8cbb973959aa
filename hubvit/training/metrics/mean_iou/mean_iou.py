"""Mean intersection-over-union as an `evaluate` metric shipped with hubvit, because `evaluate.load("mean_iou")`
needs the Hub. The same inputs, arguments and outputs as the Hub's `evaluate-metric/mean_iou` (without its
`label_map` and `reduce_labels`): per class, IoU = |prediction & truth| / |prediction | truth| over every pixel of
every image, pixels labelled `ignore_index` left out; `mean_iou` is the mean over the classes that occur in the
predictions or the references (a class in neither has IoU NaN and is left out, as `np.nanmean` does there).

Load it by path: `evaluate.load(path_to_this_file)`.
"""

import datasets
import evaluate
import numpy as np


class MeanIoU(evaluate.Metric):
    """Mean IoU, mean per-class accuracy and overall pixel accuracy of semantic segmentation maps."""

    def _info(self):
        return evaluate.MetricInfo(
            description="Intersection over union per class, averaged over classes, from class-id maps.",
            citation="",
            inputs_description="predictions, references: 2-D maps (height, width) of class ids, one per image.",
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Sequence(datasets.Value("uint16"))),
                    "references": datasets.Sequence(datasets.Sequence(datasets.Value("uint16"))),
                }
            ),
        )

    def _compute(self, predictions, references, num_labels, ignore_index=255):
        if len(references) == 0:
            raise ValueError("mean IoU of an empty evaluation set is undefined")
        confusion = np.zeros((num_labels, num_labels), np.int64)
        for prediction, reference in zip(predictions, references):
            prediction, reference = np.asarray(prediction, np.int64), np.asarray(reference, np.int64)
            if prediction.shape != reference.shape:
                raise ValueError(f"a prediction of shape {prediction.shape} for a reference of {reference.shape}")
            kept = reference != ignore_index
            truth, guess = reference[kept], prediction[kept]
            outside = (truth < 0) | (truth >= num_labels) | (guess < 0) | (guess >= num_labels)
            if outside.any():
                value = int(truth[outside][0] if ((truth < 0) | (truth >= num_labels)).any() else guess[outside][0])
                raise ValueError(f"class id {value} outside 0..{num_labels - 1} (num_labels={num_labels})")
            confusion += np.bincount(truth * num_labels + guess, minlength=num_labels**2).reshape(num_labels, -1)
        intersection = np.diag(confusion).astype(np.float64)
        truth_area, predicted_area = confusion.sum(1), confusion.sum(0)
        union = truth_area + predicted_area - intersection
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = intersection / union
            accuracy = intersection / truth_area
        return {
            "mean_iou": float(np.nanmean(iou)),
            "mean_accuracy": float(np.nanmean(accuracy)),
            "overall_accuracy": float(intersection.sum() / max(truth_area.sum(), 1)),
            "per_category_iou": iou,
            "per_category_accuracy": accuracy,
        }
