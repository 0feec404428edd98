"""What the proxy tells about itself: logs, metrics, the recent requests."""
