package s3events

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
)

// Planned is what one object event of a notification comes to: an import
// to run (Request, when Outcome is empty), or the answer without one.
type Planned struct {
	Bucket, Key string
	// Request is the validated import, when Outcome is "".
	Request jobs.ImportRequest
	// Outcome is "" (run Request), "ignored" (not the completion of a
	// folder), "unmapped" (a folder of no tenant, or of a refused bucket)
	// or "invalid_input" (mapped, but the tenant, database or company in
	// its path is not valid).
	Outcome       string
	Field, Reason string
	// IgnoredReason is, when Outcome is "ignored", why (IgnoredDataObject,
	// IgnoredNotCreated, IgnoredUnknownEvent, IgnoredUnknownSource);
	// Reason then says it in words.
	IgnoredReason string
	// Status is the HTTP status of a refusal.
	Status int
	// DataFolder is, for the creation of a data object (not a marker,
	// folder.IsMarker) in a folder that maps to a tenant, the import of
	// that folder (its directory), though the event is ignored: a door
	// looks it up (FindLateObjects) to tell an object added to a folder
	// already published.
	DataFolder *jobs.ImportRequest
	// BatchID is the published batch of a late_object outcome.
	BatchID int64
}

// PlanEvents decides, for every object event, whether it completes a
// folder (its marker was created) and which tenant's import that folder
// is, by m, the one mapping rule of every door. Each import is validated
// here, so the list of requests with an empty Outcome can be enqueued as
// they are, one by one or together.
func PlanEvents(events []ObjectEvent, marker string, m folder.Mapping) []Planned {
	plans := make([]Planned, 0, len(events))
	for _, ev := range events {
		p := Planned{Bucket: ev.Bucket, Key: ev.Key, Status: http.StatusOK}
		dir, isMarker := folderOf(ev.Key, marker)
		switch target, err := m.ResolveObjectFolder(ev.Bucket, dir); {
		case ev.Created && !isMarker && !folder.IsMarker(path.Base(ev.Key)) && err == nil:
			p.ignore(IgnoredDataObject, marker, ev)
			req := jobs.ImportRequest{TenantID: target.TenantID, TenantDatabase: target.TenantDatabase, CompanyID: target.CompanyID, Folder: target.Folder}
			if jobs.ValidateImport(req) == nil {
				p.DataFolder = &req
			}
		case !ev.Created:
			p.ignore(cmp.Or(ev.Ignore, IgnoredNotCreated), marker, ev)
		case !isMarker:
			p.ignore(IgnoredDataObject, marker, ev)
		case errors.Is(err, folder.ErrInvalidFolder) && folder.ValidateBucketName(ev.Bucket) != nil:
			p.Outcome, p.Field, p.Reason, p.Status = "invalid_input", "bucket", err.Error(), http.StatusUnprocessableEntity
		case errors.Is(err, folder.ErrInvalidFolder):
			p.Outcome, p.Field, p.Reason, p.Status = "invalid_input", "folder", err.Error(), http.StatusUnprocessableEntity
		case err != nil:
			p.Outcome, p.Reason, p.Status = "unmapped", err.Error(), http.StatusUnprocessableEntity
		default:
			p.Request = jobs.ImportRequest{TenantID: target.TenantID, TenantDatabase: target.TenantDatabase, CompanyID: target.CompanyID, Folder: target.Folder}
			if err := jobs.ValidateImport(p.Request); err != nil {
				p.Outcome, p.Status = "invalid_input", http.StatusUnprocessableEntity
				if in, ok := err.(*jobs.InputError); ok {
					p.Field, p.Reason = in.Field, in.Reason
				} else {
					p.Field, p.Reason = "folder", err.Error()
				}
			}
		}
		plans = append(plans, p)
	}
	return plans
}

// ignore makes p the answer to an event that completes no folder, for
// reason (one of IgnoredReasons), saying why in words.
func (p *Planned) ignore(reason, marker string, ev ObjectEvent) {
	p.Outcome, p.IgnoredReason = "ignored", reason
	switch reason {
	case IgnoredDataObject:
		p.Reason = fmt.Sprintf("not the folder's completion marker (%s): the folder is imported when its marker is created", marker)
	case IgnoredNotCreated:
		p.Reason = fmt.Sprintf("event %q creates no object", ev.Name)
	case IgnoredUnknownEvent:
		p.Reason = fmt.Sprintf("event name %q is not one an S3-compatible store is known to send (ObjectCreated:*, with or without the s3: prefix, completes a folder)", ev.Name)
	case IgnoredUnknownSource:
		p.Reason = fmt.Sprintf("eventSource %q is not an S3 store's (<store>:s3, such as aws:s3, minio:s3 or ceph:s3)", ev.Source)
	}
}

// folderOf returns the directory of an object key, and whether its base name
// is the completion marker.
func folderOf(key, marker string) (string, bool) {
	dir, base := path.Split(key)
	return strings.TrimSuffix(dir, "/"), base == marker
}
