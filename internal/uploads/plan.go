package uploads

import (
	"fmt"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
)

// ImportBody is the body of POST /v1/imports. Over HTTP an import is an S3
// import of the folder's own tenant: TenantID, TenantDatabase and CompanyID
// come from the folder's path (folder.Mapping), and may be omitted; when given
// they must agree with it.
type ImportBody struct {
	TenantID       string `json:"tenant_id,omitempty"`
	TenantDatabase string `json:"tenant_database,omitempty"`
	CompanyID      string `json:"company_id,omitempty"`
	Folder         string `json:"folder"`
	Reimport       bool   `json:"reimport,omitempty"`
	// NoMarker opts out of the completion marker (jobs.ImportRequest);
	// absent, the door's default applies (Config.ImportsWithoutMarker).
	NoMarker *bool `json:"no_marker,omitempty"`
	// MaxBadRecords is the import's tolerance of bad records
	// (jobs.ImportRequest); absent, the door's default applies
	// (Config.MaxBadRecords).
	MaxBadRecords *int `json:"max_bad_records,omitempty"`
}

// errLocalFolder explains why a file:// or mem:// folder is refused.
const errLocalFolder = "only s3:// folders are imported over HTTP (file:// and mem:// are for the command line, or for development with --dev-allow-local-folders)"

// ResolveImport turns an HTTP import request into the import it may run, or
// the refusal (the field at fault and why). The folder must be an s3://
// folder of an accepted bucket matching the mapping's pattern, which names
// the tenant, database and company; a body naming others is refused.
// allowLocal admits file:// and mem:// folders with the body's tenant,
// database and company, for development only. Nothing is written.
func ResolveImport(m folder.Mapping, body ImportBody, allowLocal bool) (jobs.ImportRequest, *jobs.InputError) {
	return ResolveImportWith(m, body, ImportRules{AllowLocal: allowLocal})
}

// ImportRules are a door's rules for ResolveImport beyond its mapping.
type ImportRules struct {
	// AllowLocal admits file:// and mem:// folders (development only).
	AllowLocal bool
	// WithoutMarker is the marker opt-out of a body that does not say
	// (no_marker absent): false, the marker is required.
	WithoutMarker bool
	// MaxBadRecords is the tolerance of bad records of a body that does
	// not say (max_bad_records absent).
	MaxBadRecords int
}

// ResolveImportWith is ResolveImport under rules.
func ResolveImportWith(m folder.Mapping, body ImportBody, rules ImportRules) (jobs.ImportRequest, *jobs.InputError) {
	allowLocal := rules.AllowLocal
	f, err := folder.Canonicalize(body.Folder)
	if err != nil {
		return jobs.ImportRequest{}, &jobs.InputError{Field: "folder", Reason: err.Error()}
	}
	req := jobs.ImportRequest{
		TenantID: body.TenantID, TenantDatabase: body.TenantDatabase, CompanyID: body.CompanyID,
		Folder: f.String(), Reimport: body.Reimport, NoMarker: rules.WithoutMarker, MaxBadRecords: rules.MaxBadRecords,
	}
	if body.NoMarker != nil {
		req.NoMarker = *body.NoMarker
	}
	if body.MaxBadRecords != nil {
		req.MaxBadRecords = *body.MaxBadRecords
	}
	switch {
	case f.Scheme == folder.SchemeS3:
		target, err := m.Resolve(f)
		if err != nil {
			return jobs.ImportRequest{}, &jobs.InputError{Field: "folder", Reason: err.Error()}
		}
		for _, c := range []struct{ field, body, path string }{
			{"tenant_id", body.TenantID, target.TenantID},
			{"tenant_database", body.TenantDatabase, target.TenantDatabase},
			{"company_id", body.CompanyID, target.CompanyID},
		} {
			if c.body != "" && c.body != c.path {
				return jobs.ImportRequest{}, &jobs.InputError{Field: c.field,
					Reason: fmt.Sprintf("the folder's path names %s %q, the request %q: a folder is imported only as its own tenant's", c.field, c.path, c.body)}
			}
		}
		req.TenantID, req.TenantDatabase, req.CompanyID = target.TenantID, target.TenantDatabase, target.CompanyID
	case !allowLocal:
		return jobs.ImportRequest{}, &jobs.InputError{Field: "folder", Reason: errLocalFolder}
	}
	if err := jobs.ValidateImport(req); err != nil {
		in, ok := err.(*jobs.InputError)
		if !ok {
			in = &jobs.InputError{Field: "folder", Reason: err.Error()}
		}
		return jobs.ImportRequest{}, in
	}
	return req, nil
}
