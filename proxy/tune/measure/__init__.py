"""One measured request, from sending it to the store on disk."""
