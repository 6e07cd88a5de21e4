package s3events

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
)

// OutcomeLateObject answers the creation of a data object in a folder
// whose newest batch Succeeded: the published slice does not hold the
// object as it is now (an object added to, or rewritten in, a folder
// already loaded). It is answered 200 like ignored, naming the folder and
// the batch, and counted and logged once per folder and request (or
// message); enqueue reconcile finds the changed folder and imports it
// again.
const OutcomeLateObject = "late_object"

// maxLateKeysLogged bounds the keys a late folder's log line names.
const maxLateKeysLogged = 20

// LatestFinder returns the newest batch of each scope that has one, in one
// statement; *batch.Store is one.
type LatestFinder interface {
	LatestMany(ctx context.Context, scopes []batch.ScopeOf) (map[batch.ScopeOf]batch.Batch, error)
}

// LateFolder is a published folder that the object events of one request
// or message name data objects of.
type LateFolder struct {
	// Folder is the canonical folder, TenantID its tenant.
	Folder   string
	TenantID string
	// BatchID is its newest batch, which Succeeded.
	BatchID int64
	// Keys are the data objects named (at most maxLateKeysLogged, 20),
	// Events how many events named them.
	Keys   []string
	Events int
}

// FindLateObjects looks up, in one statement for all of plans, the folders
// of the data objects whose creation they name (Planned.DataFolder), and
// marks the plans of each folder whose newest batch Succeeded
// OutcomeLateObject, with the batch (Planned.BatchID) and a reason naming
// the folder. It returns those folders, once each, in the order of their
// first event. Other plans are left as they are.
func FindLateObjects(ctx context.Context, latest LatestFinder, plans []Planned) ([]LateFolder, error) {
	var scopes []batch.ScopeOf
	at := map[batch.ScopeOf][]int{}
	for i, p := range plans {
		if p.DataFolder == nil {
			continue
		}
		f, err := folder.Canonicalize(p.DataFolder.Folder)
		if err != nil {
			continue // PlanEvents validated it: unreachable
		}
		k := batch.ScopeOf{TenantID: p.DataFolder.TenantID, SourceScope: f.Scope()}
		if _, seen := at[k]; !seen {
			scopes = append(scopes, k)
		}
		at[k] = append(at[k], i)
	}
	if len(scopes) == 0 {
		return nil, nil
	}
	newest, err := latest.LatestMany(ctx, scopes)
	if err != nil {
		return nil, fmt.Errorf("looking up the batches of %d folders: %w", len(scopes), err)
	}
	for _, k := range scopes {
		b, ok := newest[k]
		if !ok || b.Status != batch.StatusSucceeded {
			continue
		}
		for _, i := range at[k] {
			p := &plans[i]
			p.Outcome, p.BatchID, p.IgnoredReason = OutcomeLateObject, b.ID, ""
			p.Reason = fmt.Sprintf("%s was published by batch %d, which does not hold this object as it is now; enqueue reconcile imports the folder again", p.DataFolder.Folder, b.ID)
		}
	}
	return LateFoldersOf(plans), nil
}

// LateFoldersOf returns the folders of the plans FindLateObjects marked
// late_object, once each, in the order of their first event: for a
// consumer that looked up several messages' plans at once and counts each
// message's folders.
func LateFoldersOf(plans []Planned) []LateFolder {
	var late []LateFolder
	at := map[[2]string]int{}
	for _, p := range plans {
		if p.Outcome != OutcomeLateObject || p.DataFolder == nil {
			continue
		}
		k := [2]string{p.DataFolder.TenantID, p.DataFolder.Folder}
		i, ok := at[k]
		if !ok {
			i = len(late)
			at[k] = i
			late = append(late, LateFolder{Folder: p.DataFolder.Folder, TenantID: p.DataFolder.TenantID, BatchID: p.BatchID})
		}
		lf := &late[i]
		lf.Events++
		if len(lf.Keys) < maxLateKeysLogged {
			lf.Keys = append(lf.Keys, p.Key)
		}
	}
	return late
}

// LogLateFolders logs each late folder once: door names the door
// (events_s3, sqs).
func LogLateFolders(logger *slog.Logger, door string, late []LateFolder) {
	for _, lf := range late {
		logger.Warn("object events for a published folder: its slice does not hold these objects as they are now",
			"door", door, "folder", lf.Folder, "tenant_id", lf.TenantID, "batch_id", lf.BatchID,
			"events", lf.Events, "keys", lf.Keys, "keys_truncated", lf.Events > len(lf.Keys))
	}
}
