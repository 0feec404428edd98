"""What a tune run measures, sized to the server, and how long it takes."""
