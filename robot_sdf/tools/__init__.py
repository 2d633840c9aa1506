"""Command-line tools around a running sdf_server node (render_slice) and asset generation."""
