"""PNG figures with matplotlib's Agg backend (`Figure` objects, no pyplot state, no display needed)."""

import numpy as np


def new_figure(figsize):
    """A matplotlib `Figure`; matplotlib is imported here so the CLI starts without the `plot` extra."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("hubvit's figures need matplotlib: pip install 'hubvit[plot]'") from error
    return Figure(figsize=figsize)


def save(figure, path):
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot_attention_distance(result, path, title="Mean attention distance"):
    """The paper's Figure 7 (right): one dot per head, network depth on x, distance in pixels on y."""
    distance = np.asarray(result["mean_distance"])
    layers, heads = distance.shape
    figure = new_figure(figsize=(5.5, 4))
    axes = figure.subplots()
    for head in range(heads):
        axes.scatter(np.arange(1, layers + 1), distance[:, head], s=14, label=f"head {head}" if heads <= 16 else None)
    extent = max(result["image_size"])
    axes.axhline(extent, color="0.3", linestyle="--", linewidth=1, label=f"image side ({extent} px)")
    axes.axhline(
        result["uniform_attention_distance"], color="0.5", linestyle=":", linewidth=1, label="uniform attention"
    )
    axes.set_xlabel("network depth (layer)")
    axes.set_ylabel("mean attention distance (pixels)")
    axes.set_ylim(0, extent * 1.05)
    axes.set_xticks(np.arange(1, layers + 1))
    axes.set_title(f"{title} ({result['images']} images)")
    axes.legend(fontsize=6, ncol=2, loc="lower right")
    return save(figure, path)


def plot_position_similarity(similarity, path, title="Position embedding similarity"):
    """G x G tiles; tile (i, j) is the cosine similarity of patch (i, j)'s position vector with every patch."""
    similarity = np.asarray(similarity)
    gh, gw = similarity.shape[:2]
    figure = new_figure(figsize=(1.0 + 0.42 * gw, 0.6 + 0.42 * gh))
    grid = figure.subplots(gh, gw, squeeze=False, gridspec_kw={"wspace": 0.06, "hspace": 0.06})
    for i in range(gh):
        for j in range(gw):
            image = grid[i, j].imshow(similarity[i, j], vmin=-1, vmax=1, cmap="viridis")
            grid[i, j].set_xticks([])
            grid[i, j].set_yticks([])
        grid[i, 0].set_ylabel(str(i + 1), rotation=0, fontsize=6, labelpad=6)
    for j in range(gw):
        grid[-1, j].set_xlabel(str(j + 1), fontsize=6)
    figure.colorbar(image, ax=grid, fraction=0.03, label="cosine similarity")
    figure.suptitle(title, fontsize=9)
    figure.supxlabel("input patch column", fontsize=8)
    figure.supylabel("input patch row", fontsize=8)
    return save(figure, path)


def plot_relative_bias(tables, path, title="Relative position bias"):
    """One panel per head: the logit bias added for a key at offset (dy, dx) from the query."""
    tables = np.asarray(tables)
    heads, h, w = tables.shape
    columns = min(heads, 4)
    rows = -(-heads // columns)
    figure = new_figure(figsize=(2.2 * columns, 2.2 * rows))
    panels = figure.subplots(rows, columns, squeeze=False)
    gh, gw = (h + 1) // 2, (w + 1) // 2
    for index, axes in enumerate(panels.flat):
        if index >= heads:
            axes.axis("off")
            continue
        image = axes.imshow(tables[index], cmap="coolwarm", extent=(-gw + 0.5, gw - 0.5, gh - 0.5, -gh + 0.5))
        axes.set_title(f"head {index}", fontsize=8)
        axes.set_xlabel("dx", fontsize=7)
        axes.set_ylabel("dy", fontsize=7)
        figure.colorbar(image, ax=axes, fraction=0.046)
    figure.suptitle(title, fontsize=9)
    return save(figure, path)


def plot_attention_map(image, attention, path, title="Attention"):
    """The image, and the (gh, gw) map stretched over it as a heat overlay."""
    image = np.asarray(image)
    attention = np.asarray(attention, dtype=np.float64)
    attention = attention / max(attention.max(), 1e-12)
    figure = new_figure(figsize=(7, 3.6))
    left, right = figure.subplots(1, 2)
    height, width = image.shape[:2]
    for axes in (left, right):
        axes.imshow(image, cmap="gray" if image.ndim == 2 else None)
        axes.set_xticks([])
        axes.set_yticks([])
    right.imshow(
        attention, cmap="jet", alpha=0.5, extent=(-0.5, width - 0.5, height - 0.5, -0.5), interpolation="bilinear"
    )
    left.set_title("input", fontsize=9)
    right.set_title(title, fontsize=9)
    return save(figure, path)
