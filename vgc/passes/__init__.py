"""Graph passes run on the Dynamo graph before splitting (none are enabled yet)."""
