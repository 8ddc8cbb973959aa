"""The ViT body shared by `HubViTModel` and `HubViTBackbone` (modeling_hubvit.py): patch and position embedding of
whole images or of patch sequences (naflex_hubvit.py), the optional norm before the encoder, the encoder's one loop,
the final norm, and the per-block token maps dense heads read (timm's `forward_intermediates`).

This file travels to the Hub next to every checkpoint: flat, no I/O, imported relatively.
"""

from .layers_hubvit import HubViTEmbeddings, HubViTEncoder, check_pixel_values, make_norm, take_indices
from .naflex_hubvit import check_patch_sequence, embed_patch_sequence, from_timm_naflex
from .rotary_hubvit import Positions


class HubViTBody:
    """The ViT body shared by `HubViTModel` and `HubViTBackbone`: patch and position embedding, the optional norm
    before the encoder, the encoder, the final norm; and the per-block token maps dense heads read."""

    def build_body(self, config):
        """The body's modules, their position kind looked up once and shared by the embeddings and every block."""
        position = Positions(config)
        self.embeddings = HubViTEmbeddings(config, position)
        self.pre_norm = make_norm(config) if config.pre_norm else None
        self.encoder = HubViTEncoder(config, position)
        final = config.final_norm and not config.fc_norm
        self.norm = make_norm(config, eps=config.final_norm_eps) if final else None

    def get_input_embeddings(self):
        return self.embeddings.patch_embedding

    def embed(self, pixel_values, patch_size=None, pixel_attention_mask=None, spatial_shapes=None):
        """The encoder's input for `pixel_values` (checked, padded where configured), the patch grid and None; for a
        batch of patch sequences (`spatial_shapes`, naflex_hubvit.py) their (B, 2) shapes and the mask over the
        padding."""
        mask = None
        if spatial_shapes is not None:
            check_patch_sequence(pixel_values, pixel_attention_mask, spatial_shapes, self.config)
            grid = spatial_shapes  # rotary kinds turn each image's patches by its own grid
            hidden_states, mask = embed_patch_sequence(
                self.embeddings, pixel_values, pixel_attention_mask, spatial_shapes
            )
        else:
            pixel_values = check_pixel_values(pixel_values, self.config, patch_size)
            pixel_values = pixel_values.to(self.embeddings.patch_embedding.weight.dtype)
            hidden_states, grid = self.embeddings(pixel_values, patch_size)
        if self.pre_norm is not None:
            hidden_states = self.pre_norm(hidden_states)
        return hidden_states, grid, mask

    def run_blocks(
        self,
        pixel_values,
        last_block,
        patch_size=None,
        output_attentions=False,
        pixel_attention_mask=None,
        spatial_shapes=None,
    ):
        """The encoder input and the outputs of blocks 0 ... `last_block` (before the final norm), the patch grid
        (the (B, 2) shapes for patch sequences), and each run block's attention weights when asked for."""
        hidden_states, grid, mask = self.embed(pixel_values, patch_size, pixel_attention_mask, spatial_shapes)
        padding = {} if mask is None else {"attention_mask": mask}
        states, attentions, handles = [hidden_states], [], []
        if output_attentions:
            handles = [
                layer.attention.register_forward_hook(lambda module, inputs, out: attentions.append(out[1]))
                for layer in self.encoder.layers[: last_block + 1]
            ]
        try:
            self.encoder(hidden_states, grid, None, last_block, states, output_attentions=output_attentions, **padding)
        finally:
            for handle in handles:
                handle.remove()
        return states, grid, attentions

    def final_norm(self, hidden_states):
        """The final norm on tokens; models that norm after pooling (`fc_norm`) have none, as in timm."""
        return hidden_states if self.norm is None else self.norm(hidden_states)

    def to_feature_map(self, hidden_states, grid, spatial_shapes=None):
        """(batch, tokens, D) -> (batch, D, rows, columns): prefix tokens dropped, patches in row-major order. For
        patch sequences (`spatial_shapes`) a tuple of each image's (D, rows, columns) map at its own grid."""
        patches = hidden_states[:, self.config.num_prefix_tokens :]
        if spatial_shapes is not None:
            return tuple(
                image[: rows * columns].reshape(rows, columns, -1).permute(2, 0, 1).contiguous()
                for image, (rows, columns) in zip(patches, spatial_shapes.tolist())
            )
        return patches.reshape(patches.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()

    def forward_intermediates(
        self,
        pixel_values,
        indices=None,
        return_prefix_tokens=False,
        norm=False,
        stop_early=False,
        output_fmt="NCHW",
        intermediates_only=False,
        output_dict=False,
        *,
        patch_size=None,
        pixel_attention_mask=None,
        spatial_shapes=None,
    ):
        """timm's `VisionTransformer.forward_intermediates`, same arguments and results, so timm-style dense code
        (detection and segmentation necks, feature probes) runs on a hubvit model unchanged.

        `indices` are block indices (None: every block, an int n: the last n); intermediates come in block order,
        before the final norm unless `norm`; `output_fmt` "NCHW" gives (batch, D, rows, columns) without the
        prefix tokens (with `return_prefix_tokens`, (map, prefix tokens) pairs), "NLC" the patch tokens. Returns
        (final tokens after the norm, intermediates), the intermediates alone, or timm's dict (`output_dict`).
        `stop_early` runs no block after the last one asked for (the final tokens are then that block's).
        Patch sequences (`pixel_attention_mask`, `spatial_shapes`, or timm's NaFlex dict as `pixel_values`): "NCHW"
        gives, per block, a tuple of each image's map at its own grid; "NLC" the padded patch tokens (timm's
        NaFlexVit gives these only), with `patch_valid` in the dict.
        """
        if isinstance(pixel_values, dict):  # timm's NaFlex batch
            pixel_values, pixel_attention_mask, spatial_shapes = from_timm_naflex(pixel_values)
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r} is not supported; expected 'NCHW' or 'NLC'")
        take, last = take_indices(len(self.encoder.layers), indices)
        run_to = last if stop_early else len(self.encoder.layers) - 1
        states, grid, _ = self.run_blocks(
            pixel_values, run_to, patch_size, pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes
        )
        chosen = [self.final_norm(states[i + 1]) if norm else states[i + 1] for i in range(run_to + 1) if i in take]
        prefix_count = self.config.num_prefix_tokens
        prefix = [state[:, :prefix_count] for state in chosen] if prefix_count else None
        if output_fmt == "NCHW":
            chosen = [self.to_feature_map(state, grid, spatial_shapes) for state in chosen]
        else:
            chosen = [state[:, prefix_count:] for state in chosen]
        if output_dict:
            result = {"image_intermediates": chosen}
            if spatial_shapes is not None:
                result["patch_valid"] = pixel_attention_mask.bool()
            if prefix is not None and return_prefix_tokens:
                result["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                result["image_features"] = self.final_norm(states[-1])
            return result
        if return_prefix_tokens and prefix is not None:
            chosen = list(zip(chosen, prefix))
        if intermediates_only:
            return chosen
        return self.final_norm(states[-1]), chosen
