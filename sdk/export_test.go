package sdk

// SetTestHookLeased sets a function a restore runs between the agent's
// lease on the shard and the request for its descriptor; nil removes it.
func SetTestHookLeased(f func()) { testHookLeased = f }
