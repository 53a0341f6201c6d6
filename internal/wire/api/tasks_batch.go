package api

// MaxTaskBatch is the most tasks one POST /api/v1/tasks:batch enqueues.
const MaxTaskBatch = 1000

// EnqueueTaskBatchRequest is POST /api/v1/tasks:batch: up to MaxTaskBatch
// enqueue requests, validated each as POST /api/v1/tasks validates one and
// stored all or none. A field error names its item: items[3].params.x.
type EnqueueTaskBatchRequest struct {
	Items []EnqueueTaskRequest `json:"items"`
}

// EnqueueTaskBatchResponse is the 201 answer of POST /api/v1/tasks:batch:
// the queued tasks, in the order of the request's items.
type EnqueueTaskBatchResponse struct {
	Tasks []Task `json:"tasks"`
}
