"""Chat templates: the default one, a checkpoint's Jinja template, and append-only token ids per message."""
