"""What one sequence's generation needs, whichever session runs it."""
