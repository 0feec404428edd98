"""The live page at /ui/: static HTML, JavaScript and CSS shipped in the package (no build step,
no CDN: the box may be offline), reading the admin API with the key from the URL's fragment."""
